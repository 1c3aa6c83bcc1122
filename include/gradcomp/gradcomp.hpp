/// \file gradcomp.hpp
/// Everything gradcomp offers on the host, in one include.
#pragma once

#include <gradcomp/accumulate.hpp>
#include <gradcomp/backend/host.hpp>
#include <gradcomp/compressor.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/correct/chain.hpp>
#include <gradcomp/correct/clip_norm.hpp>
#include <gradcomp/correct/compact.hpp>
#include <gradcomp/correct/error_feedback.hpp>
#include <gradcomp/correct/low_pass.hpp>
#include <gradcomp/correct/momentum.hpp>
#include <gradcomp/correct/none.hpp>
#include <gradcomp/encode/codings.hpp>
#include <gradcomp/encode/index_value.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/float16.hpp>
#include <gradcomp/message.hpp>
#include <gradcomp/presets.hpp>
#include <gradcomp/schedule/ratio_plan.hpp>
#include <gradcomp/schedule/warmup.hpp>
#include <gradcomp/select/chunk_local.hpp>
#include <gradcomp/select/exact_topk.hpp>
#include <gradcomp/select/given_indices.hpp>
#include <gradcomp/select/random_k.hpp>
#include <gradcomp/select/sampled_threshold.hpp>
#include <gradcomp/select/threshold.hpp>
