"""Native FLUX.1: transformer built from diffserve.layers, weights remap, sampling and
the pipeline."""
