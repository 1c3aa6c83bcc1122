"""The programs behind docs/results.md and docs/benchmarks.md (README.md here maps each
section to its command). Run them from the repository's root as modules, e.g.
`python -m experiments.ddp_hooks`: they import `experiments.*` and the examples' model and
data (`examples.fashion_mnist`) as packages."""
