// Data-parallel training of a 784-256-10 MLP on Fashion-MNIST with W MPI ranks, each on
// its own shard, the gradients exchanged by the method chosen on the command line.
//
//   mpirun -n 4 train_fashion_mnist --method dgc --epochs 10
//   mpirun -n 4 train_fashion_mnist --method all            # every method, one table
//   mpirun -n 4 train_fashion_mnist --method dagc --shards 1,2,3,4
//   mpirun -n 8 train_fashion_mnist --method ok_topk        # Ok-Topk's global top-k
//   mpirun -n 4 train_fashion_mnist --method topk_ef4       # its memory in 4 bits (also topk_ef8, dgc8, dgc4)
//
// Every rank holds the same model; each step it computes the gradient of its own batch
// (its share of the global batch, proportional to its shard), compresses each layer
// (one compressor per layer, as DGC does), and the layers of all ranks travel in one
// bucketed exchange. The model's math is Eigen; the data are the IDX files of Debian's
// dataset-fashion-mnist package.
#include <gradcomp/comm/mpi.hpp>
#include <gradcomp/gradcomp.hpp>

#include <Eigen/Dense>
#include <mpi.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using vector = Eigen::VectorXf;

// --- data ------------------------------------------------------------------------------

struct dataset {
  matrix images;  // one row per image, pixels scaled to [0, 1]
  std::vector<int> labels;
};

// Reads an IDX file, gzip-compressed or not (zlib reads both).
std::vector<unsigned char> read_idx(const std::string& path, std::uint32_t magic, std::vector<std::uint32_t>& dims) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error("cannot open " + path + " (install dataset-fashion-mnist or pass --data)");
  std::unique_ptr<gzFile_s, int (*)(gzFile)> closer(f, gzclose);
  auto read_u32 = [&] {
    unsigned char b[4];
    if (gzread(f, b, 4) != 4) throw std::runtime_error(path + ": truncated header");
    return std::uint32_t{b[0]} << 24 | std::uint32_t{b[1]} << 16 | std::uint32_t{b[2]} << 8 | b[3];
  };
  if (const auto m = read_u32(); m != magic) throw std::runtime_error(path + ": not an IDX file of the expected kind");
  std::size_t total = 1;
  for (auto& d : dims) total *= (d = read_u32());
  std::vector<unsigned char> bytes(total);
  if (gzread(f, bytes.data(), static_cast<unsigned>(total)) != static_cast<int>(total)) {
    throw std::runtime_error(path + ": truncated data");
  }
  return bytes;
}

dataset load(const std::string& dir, const std::string& prefix, std::size_t limit) {
  std::vector<std::uint32_t> image_dims(3), label_dims(1);
  const auto pixels = read_idx(dir + "/" + prefix + "-images-idx3-ubyte.gz", 0x803, image_dims);
  const auto labels = read_idx(dir + "/" + prefix + "-labels-idx1-ubyte.gz", 0x801, label_dims);
  if (image_dims[0] != label_dims[0] || image_dims[1] * image_dims[2] != 784) {
    throw std::runtime_error(dir + ": images and labels of " + prefix + " do not match");
  }
  const std::size_t count = std::min<std::size_t>(image_dims[0], limit);
  dataset d{matrix(static_cast<Eigen::Index>(count), 784), std::vector<int>(labels.begin(), labels.begin() + count)};
  for (std::size_t i = 0; i < count * 784; ++i) d.images.data()[i] = static_cast<float>(pixels[i]) / 255.0f;
  return d;
}

// --- model -----------------------------------------------------------------------------

// 784-256-10, ReLU, softmax cross-entropy. The parameters (and the gradient) are one flat
// array, layer after layer; each layer is compressed on its own.
struct mlp {
  static constexpr int in = 784, hidden = 256, out = 10;
  static constexpr std::array<std::size_t, 4> layer_sizes{hidden * in, hidden, out* hidden, out};
  static constexpr std::size_t size = hidden * in + hidden + out * hidden + out;

  template <class T>
  static std::vector<std::span<T>> layers(std::span<T> flat) {
    std::vector<std::span<T>> v;
    std::size_t at = 0;
    for (const auto n : layer_sizes) {
      v.push_back(flat.subspan(at, n));
      at += n;
    }
    return v;
  }

  std::vector<float> params = std::vector<float>(size);

  explicit mlp(std::uint64_t seed) {  // He initialisation, the same on every rank
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n1(0.0f, std::sqrt(2.0f / in)), n2(0.0f, std::sqrt(2.0f / hidden));
    const auto l = layers(std::span<float>(params));
    for (auto& w : l[0]) w = n1(rng);
    for (auto& w : l[2]) w = n2(rng);
  }

  // The gradient of sum over the batch of the loss, times `scale`, into `grad`.
  void gradient(const matrix& x, std::span<const int> y, float scale, std::span<float> grad) const {
    const auto p = layers(std::span<const float>(params));
    const auto g = layers(grad);
    const Eigen::Map<const matrix> w1(p[0].data(), hidden, in), w2(p[2].data(), out, hidden);
    const Eigen::Map<const vector> b1(p[1].data(), hidden), b2(p[3].data(), out);
    matrix h = ((x * w1.transpose()).rowwise() + b1.transpose()).cwiseMax(0.0f);
    matrix z = (h * w2.transpose()).rowwise() + b2.transpose();
    // softmax - onehot, scaled: d loss / d z
    for (Eigen::Index r = 0; r < z.rows(); ++r) {
      const float m = z.row(r).maxCoeff();
      z.row(r) = (z.row(r).array() - m).exp();
      z.row(r) /= z.row(r).sum();
      z(r, y[static_cast<std::size_t>(r)]) -= 1.0f;
    }
    z *= scale;
    Eigen::Map<matrix>(g[2].data(), out, hidden) = z.transpose() * h;
    Eigen::Map<vector>(g[3].data(), out) = z.colwise().sum().transpose();
    matrix dh = (z * w2).cwiseProduct((h.array() > 0.0f).cast<float>().matrix());
    Eigen::Map<matrix>(g[0].data(), hidden, in) = dh.transpose() * x;
    Eigen::Map<vector>(g[1].data(), hidden) = dh.colwise().sum().transpose();
  }

  int correct(const matrix& x, std::span<const int> y) const {
    const Eigen::Map<const matrix> w1(params.data(), hidden, in), w2(params.data() + hidden * in + hidden, out, hidden);
    const Eigen::Map<const vector> b1(params.data() + hidden * in, hidden), b2(params.data() + size - out, out);
    const matrix h = ((x * w1.transpose()).rowwise() + b1.transpose()).cwiseMax(0.0f);
    const matrix z = (h * w2.transpose()).rowwise() + b2.transpose();
    int hits = 0;
    for (Eigen::Index r = 0; r < z.rows(); ++r) {
      Eigen::Index best = 0;
      z.row(r).maxCoeff(&best);
      hits += static_cast<int>(best) == y[static_cast<std::size_t>(r)];
    }
    return hits;
  }
};

// --- gradient exchange -----------------------------------------------------------------

// Bytes this worker put on the wire and took off it, summed over steps.
struct traffic {
  double sent = 0, received = 0, steps = 0;
};

// One way of turning every rank's gradient into the same update on every rank.
class exchange {
 public:
  virtual ~exchange() = default;
  virtual void begin_epoch(int /*epoch*/) {}
  // update = sum over ranks of (what the method delivers of) each rank's grad.
  virtual void step(std::span<const float> grad, std::span<float> update) = 0;
  // Does the optimizer apply momentum itself (false where the compressor corrects it)?
  [[nodiscard]] virtual bool optimizer_momentum() const { return true; }
  traffic epoch_traffic;
};

// Dense all-reduce of the float32 gradient: each worker contributes 4n bytes.
class dense_allreduce final : public exchange {
 public:
  explicit dense_allreduce(gradcomp::comm::mpi& comm) : comm_(comm) {}
  void step(std::span<const float> grad, std::span<float> update) override {
    MPI_Allreduce(grad.data(), update.data(), static_cast<int>(grad.size()), MPI_FLOAT, MPI_SUM, comm_.communicator());
    epoch_traffic.sent += 4.0 * static_cast<double>(grad.size());
    epoch_traffic.received += 4.0 * static_cast<double>(grad.size());
    epoch_traffic.steps += 1;
  }

 private:
  gradcomp::comm::mpi& comm_;
};

// One compressor per layer; all layers of all ranks in one bucketed sparse all-gather.
template <class Compressor>
class sparse_allgather final : public exchange {
 public:
  using on_epoch = std::function<void(Compressor&, int epoch)>;
  sparse_allgather(gradcomp::comm::mpi& comm, const std::function<Compressor(std::size_t n)>& make,
                   bool momentum_in_compressor = false, on_epoch epoch_hook = {})
      : comm_(comm), momentum_in_compressor_(momentum_in_compressor), epoch_hook_(std::move(epoch_hook)) {
    for (const auto n : mlp::layer_sizes) compressors_.push_back(make(n));
    buffers_.resize(compressors_.size());
  }
  void begin_epoch(int epoch) override {
    if (epoch_hook_) {
      for (auto& c : compressors_) epoch_hook_(c, epoch);
    }
  }
  [[nodiscard]] bool optimizer_momentum() const override { return !momentum_in_compressor_; }
  void step(std::span<const float> grad, std::span<float> update) override {
    const auto g = mlp::layers(grad);
    const auto u = mlp::layers(update);
    std::vector<std::span<const std::byte>> messages;
    double mine = 8.0 * static_cast<double>(1 + compressors_.size());  // the bucket's directory
    for (std::size_t t = 0; t < compressors_.size(); ++t) {
      buffers_[t].resize(compressors_[t].max_message_bytes());
      messages.push_back(compressors_[t].compress(g[t], buffers_[t]).bytes());
      mine += static_cast<double>(messages.back().size());
    }
    std::fill(update.begin(), update.end(), 0.0f);
    comm_.allgather_accumulate(messages, std::vector<std::span<float>>(u.begin(), u.end()), 1.0f);
    double all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_SUM, comm_.communicator());
    epoch_traffic.sent += mine;
    epoch_traffic.received += all - mine;
    epoch_traffic.steps += 1;
  }

 private:
  gradcomp::comm::mpi& comm_;
  bool momentum_in_compressor_;
  on_epoch epoch_hook_;
  std::vector<Compressor> compressors_;
  std::vector<std::vector<std::byte>> buffers_;
};

// ScaleCom: per layer, the step's leader picks the indices, every rank sends its values
// there, one reduction of k values: O(k) bytes per worker whatever the rank count.
class scalecom_exchange final : public exchange {
  using compressor_type = decltype(gradcomp::presets::scalecom(gradcomp::backend::host{}, 1));
  using leader_type = gradcomp::select::exact_topk;

 public:
  scalecom_exchange(gradcomp::comm::mpi& comm, double density) : comm_(comm) {
    for (const auto n : mlp::layer_sizes) {
      compressors_.push_back(std::make_unique<compressor_type>(
          gradcomp::presets::scalecom(gradcomp::backend::host{}, n, {.density = density})));
      exchanges_.emplace_back(comm, *compressors_.back(), leader_type{.density = density});
    }
  }
  void step(std::span<const float> grad, std::span<float> update) override {
    const auto g = mlp::layers(grad);
    const auto u = mlp::layers(update);
    std::fill(update.begin(), update.end(), 0.0f);
    for (std::size_t t = 0; t < exchanges_.size(); ++t) {
      const bool leader = compressors_[t]->step() % static_cast<std::uint64_t>(comm_.size()) ==
                          static_cast<std::uint64_t>(comm_.rank());
      const double k = static_cast<double>(exchanges_[t].step(g[t], u[t], 1.0f).count());
      // values into the reduction, the sum back; the leader also broadcasts count + indices
      epoch_traffic.sent += 4 * k + (leader ? 8 + 4 * k : 0);
      epoch_traffic.received += 4 * k + (leader ? 0 : 8 + 4 * k);
    }
    epoch_traffic.steps += 1;
  }

 private:
  gradcomp::comm::mpi& comm_;
  std::vector<std::unique_ptr<compressor_type>> compressors_;
  std::vector<gradcomp::comm::cyclic_topk<leader_type, compressor_type, gradcomp::comm::mpi>> exchanges_;
};

// Ok-Topk's global top-k over the whole gradient (one bucket, as Ok-Topk takes it): each
// rank sums one region of the indices, the k largest sums are all-gathered: about 2k
// entries per worker whatever the rank count.
class global_topk_exchange final : public exchange {
  using compressor_type = decltype(gradcomp::presets::topk_ef(gradcomp::backend::host{}, 1));

 public:
  global_topk_exchange(gradcomp::comm::mpi& comm, double density)
      : compressor_(gradcomp::presets::topk_ef(gradcomp::backend::host{}, mlp::size, {.density = density})),
        exchange_(comm, compressor_) {}
  void step(std::span<const float> grad, std::span<float> update) override {
    std::fill(update.begin(), update.end(), 0.0f);
    (void)exchange_.step(grad, update, 1.0f);
    epoch_traffic.sent += static_cast<double>(exchange_.last_traffic().sent);
    epoch_traffic.received += static_cast<double>(exchange_.last_traffic().received);
    epoch_traffic.steps += 1;
  }

 private:
  compressor_type compressor_;
  gradcomp::comm::sparse_allreduce<compressor_type, gradcomp::comm::mpi> exchange_;
};

// --- driver ----------------------------------------------------------------------------

struct options {
  std::string method = "dgc";
  std::string data = "/usr/share/datasets/fashion-mnist";
  int epochs = 10;
  int batch = 128;  // global batch, split over the ranks in proportion to their shards
  float lr = 0.02f;
  float momentum = 0.9f;
  double density = 0.001;
  std::vector<double> shards;  // relative shard sizes, one per rank; empty: equal
  std::size_t train_limit = 60000, test_limit = 10000;
  std::uint64_t seed = 1;
  bool verbose = false;
};

const std::vector<std::string> all_methods{"dense",    "topk",       "topk_ef", "dgc",    "adacomp",
                                           "scalecom", "randomk_ef", "dagc",    "ok_topk"};

std::unique_ptr<exchange> make_exchange(const std::string& method, gradcomp::comm::mpi& comm, const options& o,
                                        std::span<const double> shard_weights) {
  using namespace gradcomp;
  const double d = o.density;
  // topk_ef8, topk_ef4, dgc8, dgc4: the method with its memory in 8 or 4 bits.
  const bool compact = method.size() > 1 && (method.back() == '8' || method.back() == '4');
  const std::uint32_t bits = method.back() == '8' ? 8 : 4;
  if (compact && method.starts_with("topk_ef")) {
    auto make = [d, bits](std::size_t n) {
      return presets::topk_ef(backend::host{}, n, {.density = d}, presets::compact_memory{.bits = bits});
    };
    return std::make_unique<sparse_allgather<decltype(make(1))>>(comm, make);
  }
  if (method == "dense") return std::make_unique<dense_allreduce>(comm);
  if (method == "topk") {  // top-k, no memory: what is not sent is lost
    auto make = [d](std::size_t n) {
      return compressor{backend::host{}, n, select::exact_topk{.density = d}, correct::none{},
                        encode::index_value{.index = index_coding::automatic, .value = value_coding::f32}};
    };
    return std::make_unique<sparse_allgather<decltype(make(1))>>(comm, make);
  }
  if (method == "topk_ef" || method == "dagc") {
    // dagc: DAGC's plan gives workers with more data a larger share of the same total
    // budget; topk_ef on unequal shards is the uniform-density comparison.
    double mine = d;
    if (method == "dagc") mine = schedule::ratio_plan(shard_weights, d, d / 10)[static_cast<std::size_t>(comm.rank())];
    auto make = [mine](std::size_t n) { return presets::topk_ef(backend::host{}, n, {.density = mine}); };
    return std::make_unique<sparse_allgather<decltype(make(1))>>(comm, make);
  }
  // DGC: clipping, momentum correction and masking, with DGC's warm-up.
  if (method == "dgc" || (compact && method.starts_with("dgc"))) {
    const int workers = comm.size();
    auto dgc = [o, workers](std::size_t n, auto memory) {
      return presets::dgc(
          backend::host{}, n,
          {.density = 0.25, .momentum = o.momentum, .max_norm = 5.0f, .workers = workers, .seed = o.seed}, memory);
    };
    const schedule::warmup warmup{.final_density = d};
    const auto by_epoch = [warmup](auto& c, int epoch) {
      c.set_density(warmup.by_epoch(static_cast<unsigned>(epoch)));
    };
    if (compact) {
      auto make = [dgc, bits](std::size_t n) { return dgc(n, presets::compact_memory{.bits = bits}); };
      return std::make_unique<sparse_allgather<decltype(make(1))>>(comm, make, true, by_epoch);
    }
    auto make = [dgc](std::size_t n) { return dgc(n, presets::float_memory{}); };
    return std::make_unique<sparse_allgather<decltype(make(1))>>(comm, make, true, by_epoch);
  }
  if (method == "adacomp") {
    auto make = [](std::size_t n) { return presets::adacomp(backend::host{}, n); };
    return std::make_unique<sparse_allgather<decltype(make(1))>>(comm, make);
  }
  if (method == "randomk_ef") {
    auto make = [d, o](std::size_t n) {
      return presets::randomk_ef(backend::host{}, n, {.density = d, .seed = o.seed});
    };
    return std::make_unique<sparse_allgather<decltype(make(1))>>(comm, make);
  }
  if (method == "scalecom") return std::make_unique<scalecom_exchange>(comm, d);
  if (method == "ok_topk") return std::make_unique<global_topk_exchange>(comm, d);
  throw std::invalid_argument("--method: unknown method '" + method + "'");
}

struct result {
  std::string method;
  double accuracy;
  traffic last_epoch, total;
  double seconds;
};

result train(const std::string& method, gradcomp::comm::mpi& comm, const options& o, const dataset& train_set,
             const dataset& test_set) {
  // Shards: contiguous ranges in proportion to the weights; each rank's batch is its
  // share of the global batch, so all ranks take the same number of steps per epoch.
  std::vector<double> weights =
      o.shards.empty() ? std::vector<double>(static_cast<std::size_t>(comm.size()), 1.0) : o.shards;
  const double weight_sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  const auto rows = static_cast<double>(train_set.images.rows());
  const auto r = static_cast<std::size_t>(comm.rank());
  const auto first =
      static_cast<Eigen::Index>(rows * std::accumulate(weights.begin(), weights.begin() + r, 0.0) / weight_sum);
  const auto last =
      static_cast<Eigen::Index>(rows * std::accumulate(weights.begin(), weights.begin() + r + 1, 0.0) / weight_sum);
  const auto steps = static_cast<Eigen::Index>(rows) / o.batch;
  const Eigen::Index local_batch = (last - first) / steps;
  if (local_batch < 1) throw std::invalid_argument("--batch: too small for the shard of rank " + std::to_string(r));

  mlp model(o.seed);
  auto ex = make_exchange(method, comm, o, weights);
  std::vector<float> grad(mlp::size), update(mlp::size), velocity(mlp::size, 0.0f);
  std::vector<Eigen::Index> order(static_cast<std::size_t>(last - first));
  std::iota(order.begin(), order.end(), first);
  std::mt19937_64 shuffle(o.seed * 1000 + r);
  matrix x(local_batch, 784);
  std::vector<int> y(static_cast<std::size_t>(local_batch));
  long long global_batch = 0, mine = local_batch;
  MPI_Allreduce(&mine, &global_batch, 1, MPI_LONG_LONG, MPI_SUM, comm.communicator());
  const float scale = 1.0f / static_cast<float>(global_batch);
  traffic total;
  double accuracy = 0;
  MPI_Barrier(comm.communicator());
  const double start = MPI_Wtime();
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    ex->begin_epoch(epoch);
    ex->epoch_traffic = {};
    std::shuffle(order.begin(), order.end(), shuffle);
    for (Eigen::Index s = 0; s < steps; ++s) {
      for (Eigen::Index b = 0; b < local_batch; ++b) {
        const auto i = order[static_cast<std::size_t>(s * local_batch + b)];
        x.row(b) = train_set.images.row(i);
        y[static_cast<std::size_t>(b)] = train_set.labels[static_cast<std::size_t>(i)];
      }
      // The gradient of the global batch's mean loss is the sum of these over ranks.
      model.gradient(x, y, scale, grad);
      ex->step(grad, update);
      const bool momentum = ex->optimizer_momentum();
      for (std::size_t i = 0; i < mlp::size; ++i) {
        velocity[i] = momentum ? o.momentum * velocity[i] + update[i] : update[i];
        model.params[i] -= o.lr * velocity[i];
      }
    }
    // Test accuracy: each rank scores a slice of the test set.
    const Eigen::Index n_test = test_set.images.rows();
    const Eigen::Index lo = n_test * comm.rank() / comm.size(), hi = n_test * (comm.rank() + 1) / comm.size();
    int hits = model.correct(
        test_set.images.middleRows(lo, hi - lo),
        std::span<const int>(test_set.labels).subspan(static_cast<std::size_t>(lo), static_cast<std::size_t>(hi - lo)));
    int all_hits = 0;
    MPI_Allreduce(&hits, &all_hits, 1, MPI_INT, MPI_SUM, comm.communicator());
    accuracy = 100.0 * all_hits / static_cast<double>(n_test);
    total.sent += ex->epoch_traffic.sent;
    total.received += ex->epoch_traffic.received;
    total.steps += ex->epoch_traffic.steps;
    if (o.verbose && comm.rank() == 0)
      std::printf("  %s epoch %d: test accuracy %.2f%%\n", method.c_str(), epoch, accuracy);
  }
  const double seconds = MPI_Wtime() - start;
  // Per worker: the mean over ranks (ranks differ under a DAGC plan and for ScaleCom's leader).
  auto mean_over_ranks = [&](traffic t) {
    double local[2] = {t.sent, t.received}, all[2] = {};
    MPI_Allreduce(local, all, 2, MPI_DOUBLE, MPI_SUM, comm.communicator());
    return traffic{all[0] / comm.size(), all[1] / comm.size(), t.steps};
  };
  return {method, accuracy, mean_over_ranks(ex->epoch_traffic), mean_over_ranks(total), seconds};
}

std::vector<double> parse_list(const std::string& flag, const std::string& text) {
  std::vector<double> v;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const double x = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(x > 0))
      throw std::invalid_argument(flag + ": '" + item + "' is not a positive number");
    v.push_back(x);
  }
  return v;
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--verbose") {
      o.verbose = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + ": needs a value");
    const std::string value = argv[++i];
    auto number = [&] {
      char* end = nullptr;
      const double x = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(x > 0))
        throw std::invalid_argument(flag + ": '" + value + "' is not a positive number");
      return x;
    };
    if (flag == "--method")
      o.method = value;
    else if (flag == "--data")
      o.data = value;
    else if (flag == "--epochs")
      o.epochs = static_cast<int>(number());
    else if (flag == "--batch")
      o.batch = static_cast<int>(number());
    else if (flag == "--lr")
      o.lr = static_cast<float>(number());
    else if (flag == "--density")
      o.density = number();
    else if (flag == "--shards")
      o.shards = parse_list(flag, value);
    else if (flag == "--train-limit")
      o.train_limit = static_cast<std::size_t>(number());
    else if (flag == "--test-limit")
      o.test_limit = static_cast<std::size_t>(number());
    else if (flag == "--seed")
      o.seed = static_cast<std::uint64_t>(number());
    else
      throw std::invalid_argument("unknown flag " + flag);
  }
  if (o.density > 1) throw std::invalid_argument("--density: must be in (0, 1], got " + std::to_string(o.density));
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  try {
    const options o = parse(argc, argv);
    gradcomp::comm::mpi comm(MPI_COMM_WORLD);
    if (!o.shards.empty() && o.shards.size() != static_cast<std::size_t>(comm.size())) {
      throw std::invalid_argument("--shards: " + std::to_string(o.shards.size()) + " weights for " +
                                  std::to_string(comm.size()) + " ranks");
    }
    const dataset train_set = load(o.data, "train", o.train_limit);
    const dataset test_set = load(o.data, "t10k", o.test_limit);
    const std::vector<std::string> methods = o.method == "all" ? all_methods : std::vector<std::string>{o.method};
    if (comm.rank() == 0) {
      std::printf(
          "%d ranks, %d epochs, global batch %d, lr %g, density %g, %zu parameters, shards %s; bytes per worker per "
          "step (mean over ranks)\n",
          comm.size(), o.epochs, o.batch, static_cast<double>(o.lr), o.density, mlp::size,
          o.shards.empty() ? "equal" : "unequal");
      std::printf("%-11s %9s %14s %14s %9s %14s %8s\n", "method", "test acc", "sent B/step", "recv B/step", "ratio",
                  "sent B/step", "wall s");
      std::printf("%-11s %9s %14s %14s %9s %14s %8s\n", "", "", "(last epoch)", "(last epoch)", "", "(all epochs)", "");
    }
    for (const auto& m : methods) {
      const result r = train(m, comm, o, train_set, test_set);
      if (comm.rank() == 0) {
        const double sent = r.last_epoch.sent / r.last_epoch.steps;
        std::printf("%-11s %8.2f%% %14.0f %14.0f %8.0fx %14.0f %8.1f\n", r.method.c_str(), r.accuracy, sent,
                    r.last_epoch.received / r.last_epoch.steps, 4.0 * mlp::size / sent, r.total.sent / r.total.steps,
                    r.seconds);
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_fashion_mnist: %s\n", e.what());
    status = 1;
  }
  if (status != 0) MPI_Abort(MPI_COMM_WORLD, status);
  MPI_Finalize();
  return status;
}
