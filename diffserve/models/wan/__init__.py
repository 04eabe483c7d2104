"""The native Wan video denoiser (Wan2.1 text-to-video, Wan2.2's two-expert MoE and
image-to-video)."""
