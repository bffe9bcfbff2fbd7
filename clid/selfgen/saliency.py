"""Saliency maps of stage 01: the spectral residual (Hou & Zhang, CVPR 2007) and the stored map's size.

EML-Net, the paper's saliency network, is :mod:`clid.selfgen.emlnet`.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # (torch is imported where it is used: 01's --help answers without it)
    import torch

SPECTRAL_SIZE = 64  # Hou & Zhang work on a 64 x 64 image
EMLNET_SIZE = (480, 640)  # (height, width) of the SALICON images EML-Net was trained on (clid.selfgen.emlnet)


# ---------------------------------------------------------------------------------------------
# Map helpers

def map_shape(width: int, height: int, side: int) -> tuple[int, int]:
    """(h, w) of the stored map: the longer side is ``side`` cells, the aspect ratio kept."""
    scale = side / max(width, height)
    return max(1, round(height * scale)), max(1, round(width * scale))


def normalise01(maps: torch.Tensor) -> torch.Tensor:
    """Min-max normalise each [H, W] map of a [B, H, W] batch to [0, 1] (a flat map becomes 0)."""
    import torch

    flat = maps.flatten(1)
    low, high = flat.min(1).values[:, None, None], flat.max(1).values[:, None, None]
    return torch.where(high > low, (maps - low) / (high - low).clamp_min(1e-12), torch.zeros_like(maps))


def resize_map(smap: torch.Tensor, shape: tuple[int, int]) -> np.ndarray:
    """One [H, W] map resized (bilinear, anti-aliased) and re-normalised to [0, 1]."""
    import torch.nn.functional as F

    out = F.interpolate(smap[None, None], size=shape, mode="bilinear", align_corners=False, antialias=True)
    return normalise01(out[0]).numpy()[0]


# ---------------------------------------------------------------------------------------------
# Spectral residual (Hou & Zhang 2007)

def spectral_residual(gray: torch.Tensor, sigma: float = 2.5, mirror: bool = True) -> torch.Tensor:
    """Saliency of [B, H, W] grey images in [0, 1]; returns [B, H, W] maps in [0, 1].

    The Fourier transform treats the image as periodic, so the jump between opposite borders
    shows up as bright borders and corners. With ``mirror`` the image is first extended by its
    mirror image (half its size on each side), which makes it continuous across the borders,
    and the centre is cut out afterwards.
    """
    import torch
    import torch.nn.functional as F

    gray = gray.float()
    h, w = gray.shape[-2:]
    if mirror:
        gray = F.pad(gray[:, None], (w // 2, w // 2, h // 2, h // 2), mode="reflect")[:, 0]
    spectrum = torch.fft.fft2(gray)
    log_amplitude = torch.log(spectrum.abs().clamp_min(1e-12))
    # the spectral residual R = log amplitude - its 3 x 3 local average (the spectrum is periodic)
    local_mean = F.avg_pool2d(F.pad(log_amplitude[:, None], (1, 1, 1, 1), mode="circular"), 3, stride=1)[:, 0]
    # back to the image domain with the original phase P, squared: |ifft(exp(R + iP))|^2, where
    # exp(R + iP) = spectrum * exp(R - log amplitude) = spectrum * exp(-local mean)
    saliency = torch.fft.ifft2(spectrum * torch.exp(-local_mean)).abs() ** 2
    # smoothed by a Gaussian, applied in the Fourier domain (a circular blur, as the FFT sees the image)
    fy, fx = torch.fft.fftfreq(gray.shape[-2]), torch.fft.fftfreq(gray.shape[-1])
    transfer = torch.exp(-2 * math.pi ** 2 * sigma ** 2 * (fy[:, None] ** 2 + fx[None, :] ** 2))
    saliency = torch.fft.ifft2(torch.fft.fft2(saliency) * transfer).real
    if mirror:
        saliency = saliency[:, h // 2:h // 2 + h, w // 2:w // 2 + w]
    return normalise01(saliency)
