"""The warp-scheduling and CTA-dispatch policies by name, in the order the engines number them
(docs/model.md sections 7 and 9). Apart from `lower`, so that the command line lists them
without importing JAX."""

WARP_POLICIES = ("lrr", "gto", "oldest")
DISPATCH_POLICIES = ("hardware", "round_robin", "least_loaded", "weighted", "closed_loop")
