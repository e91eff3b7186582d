"""The warp-scheduling and CTA-dispatch policies by name, in the order the engines number them
(docs/model.md sections 7 and 9), and the defaults of the policy parameters. Apart from `lower`,
so that the command line lists them without importing JAX. Every front end (`js.simulate`, the
reference, sweep specs, the command line, the fits) takes its defaults from here."""

WARP_POLICIES = ("lrr", "gto", "oldest")
DISPATCH_POLICIES = ("hardware", "round_robin", "least_loaded", "weighted", "closed_loop")

DEFAULT_WARP_POLICY = "gto"
DEFAULT_DISPATCH = "hardware"
DEFAULT_DISPATCH_START = 0  # no rotation of the hardware SM order
DEFAULT_EMA_ALPHA = 0.25  # closed loop: weight of the newest CTA duration in the per-SM estimate
DEFAULT_EMA_PRIOR_NS = 0.0  # closed loop: the estimate before an SM's first CTA ends
