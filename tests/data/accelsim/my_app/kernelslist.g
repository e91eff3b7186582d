kernel-593-ctx_0x55c28dad19e0.traceg
