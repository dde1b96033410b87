"""Training one model: the loop (truncated BPTT, exact resume), its windows and corpus mixing, the
curriculum over gaps, and the shipped pretrained backbones."""
