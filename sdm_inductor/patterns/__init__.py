"""Pattern rewrites: reference token-loop code -> the fused sdm op (issue 5)."""
