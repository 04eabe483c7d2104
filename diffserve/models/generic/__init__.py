"""The generic path: diffusers pipelines whose denoiser runs on diffserve kernels."""
