"""EML-Net (Jia & Bruce, 2020), the saliency network of stage 01, for inference.

ResNet-50 encoders read out at five depths and a small decoder that fuses the read-outs of an
ImageNet and a Places encoder. Module names follow the official checkpoints, so the released
``res_imagenet.pth``, ``res_places.pth`` and ``res_decoder.pth`` load unchanged.

Checkpoints are read without unpickling (safetensors, or ``torch.load(weights_only=True)``). A
``.pth`` that holds a whole pickled module is refused; convert it once, if you trust it::

    python -m clid.emlnet convert --trust-pickle res_imagenet.pth --out res_imagenet.safetensors
"""
from __future__ import annotations

import pickle
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from clid.base.files import DataError
from clid.selfgen.saliency import EMLNET_SIZE, normalise01

EMLNET_BLUR = 5.0  # sigma of the official post-processing blur, in pixels at EMLNET_SIZE


# ---------------------------------------------------------------------------------------------
# Map helpers

def gaussian_blur(maps: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of [B, H, W] maps, edges repeated (radius 4 sigma)."""
    if sigma <= 0:
        return maps
    radius = max(1, int(4 * sigma + 0.5))
    x = torch.arange(-radius, radius + 1, dtype=maps.dtype)
    kernel = torch.exp(-x ** 2 / (2 * sigma ** 2))
    kernel = kernel / kernel.sum()
    out = maps[:, None]
    out = F.conv2d(F.pad(out, (radius, radius, 0, 0), mode="replicate"), kernel.view(1, 1, 1, -1))
    out = F.conv2d(F.pad(out, (0, 0, radius, radius), mode="replicate"), kernel.view(1, 1, -1, 1))
    return out[:, 0]


# ---------------------------------------------------------------------------------------------
# The network (module names as in the official checkpoints)

class Bottleneck(nn.Module):
    """ResNet-50 bottleneck block (1x1, 3x3 with stride, 1x1 with 4x the channels)."""

    expansion = 4

    def __init__(self, in_channels: int, channels: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.conv3 = nn.Conv2d(channels, channels * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(channels * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + shortcut)


def readout(channels: int, final: bool = False) -> nn.Sequential:
    """EML-Net's read-out: 3x3 conv to one channel, batch norm, ReLU (sigmoid for the final map)."""
    return nn.Sequential(nn.Conv2d(channels, 1, 3, padding=1), nn.BatchNorm2d(1),
                         nn.Sigmoid() if final else nn.ReLU(inplace=True))


class EMLEncoder(nn.Module):
    """ResNet-50 read out at five depths (after the stem and after each stage), plus the single-
    model head ``combined`` that fuses the five read-outs."""

    def __init__(self, blocks=(3, 4, 6, 3)):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_channels = 64
        for n, (channels, count) in enumerate(zip((64, 128, 256, 512), blocks), 1):
            stride = 1 if n == 1 else 2
            downsample = nn.Sequential(nn.Conv2d(in_channels, channels * 4, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(channels * 4))
            layer = [Bottleneck(in_channels, channels, stride, downsample)]
            layer += [Bottleneck(channels * 4, channels) for _ in range(count - 1)]
            setattr(self, f"layer{n}", nn.Sequential(*layer))
            in_channels = channels * 4
        for n, channels in enumerate((64, 256, 512, 1024, 2048)):
            setattr(self, f"output{n}", readout(channels))
        self.combined = readout(5, final=True)

    def readouts(self, x) -> list[torch.Tensor]:
        """The five one-channel read-outs, each at its own resolution."""
        stem = self.relu(self.bn1(self.conv1(x)))
        features = [stem]
        x = self.maxpool(stem)
        for n in range(1, 5):
            x = getattr(self, f"layer{n}")(x)
            features.append(x)
        return [getattr(self, f"output{n}")(f) for n, f in enumerate(features)]

    def forward(self, x):
        """The single-model prediction, at the input size."""
        outs = self.readouts(x)
        size = outs[0].shape[-2:]
        fused = self.combined(torch.cat([outs[0]] + [F.interpolate(o, size) for o in outs[1:]], 1))
        return F.interpolate(fused, x.shape[-2:])


class EMLDecoder(nn.Module):
    """Fuses the read-outs of the ImageNet and the Places encoders: a 3x3 conv per read-out, all
    resized to the output size and combined by a 3x3 conv with a sigmoid."""

    def __init__(self, num_image: int = 5, num_place: int = 5):
        super().__init__()

        def per_readout(n):
            return nn.ModuleList(nn.Sequential(nn.Conv2d(1, 1, 3, padding=1), nn.BatchNorm2d(1), nn.ReLU(inplace=True))
                                 for _ in range(n))

        self.img_model = per_readout(num_image)
        self.pla_model = per_readout(num_place)
        self.combined = readout(num_image + num_place, final=True)

    def forward(self, image_readouts, place_readouts, size):
        feats = [F.interpolate(m(r), size) for r, m in zip(image_readouts, self.img_model)]
        feats += [F.interpolate(m(r), size) for r, m in zip(place_readouts, self.pla_model)]
        return self.combined(torch.cat(feats, 1))


def read_state_dict(path) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors: plain or under "state_dict", "module." prefixes (DataParallel) removed.

    Reads ``.safetensors``, or a ``.pth`` with ``torch.load(weights_only=True)``, which refuses
    anything but tensors and plain containers: a file is never unpickled, so it cannot run code.
    A ``.pth`` that holds more (a whole pickled module) is refused with the one-time conversion
    command, ``python -m clid.emlnet convert --trust-pickle``.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(path, None, "EML-Net weights not found")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            state = load_file(str(path))
        except Exception as err:  # SafetensorError, OSError
            raise DataError(path, None, f"not a readable safetensors file ({err})") from None
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            raise DataError(path, None, "holds more than tensors, and loading it would run code stored in "
                                        "the file; it is not loaded. If you trust the file, convert it "
                                        f"once: python -m clid.emlnet convert --trust-pickle {path} --out "
                                        f"{path.with_suffix('.safetensors')}") from None
        except Exception as err:  # not a zip or legacy torch file, truncated, ...
            raise DataError(path, None, f"cannot read this file as a PyTorch checkpoint ({err})") from None
    return tensors_of(state, path)


def tensors_of(state, path) -> dict[str, torch.Tensor]:
    """The state dict inside a loaded checkpoint (a dict, a dict under "state_dict", or a module)."""
    if isinstance(state, nn.Module):
        state = state.state_dict()
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise DataError(path, None, f"expected a state dict of tensors, found {type(state).__name__}")
    return {(k[len("module."):] if k.startswith("module.") else k): v for k, v in state.items()}


def load_weights(model: nn.Module, path, what: str) -> nn.Module:
    """Load a checkpoint into ``model``; every parameter must be there with its shape (an ImageNet
    classifier's extra ``fc`` is ignored; old checkpoints may lack BN ``num_batches_tracked``)."""
    state = read_state_dict(path)
    own = model.state_dict()
    missing = [k for k in own if k not in state and not k.endswith("num_batches_tracked")]
    if missing:
        raise DataError(path, None, f"not an EML-Net {what} checkpoint: {len(missing)} of {len(own)} "
                                    f"tensors missing (e.g. '{missing[0]}')")
    wrong = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if wrong:
        raise DataError(path, None, f"'{wrong[0]}' has shape {tuple(state[wrong[0]].shape)}, "
                                    f"the EML-Net {what} expects {tuple(own[wrong[0]].shape)}")
    model.load_state_dict({k: state.get(k, v) for k, v in own.items()})
    return model.eval()


class EMLNet:
    """EML-Net inference: three files (ImageNet encoder, Places encoder, decoder) or one encoder."""

    def __init__(self, weights: list[str], size=EMLNET_SIZE, device="cpu"):
        if len(weights) not in (1, 3):
            raise DataError(None, None, "--weights takes 3 files (ImageNet encoder, Places encoder, decoder) or 1 "
                                        "encoder")
        self.size, self.device = tuple(size), device
        self.encoders = [load_weights(EMLEncoder(), w, "ResNet-50 encoder").to(device) for w in weights[:2]]
        self.decoder = load_weights(EMLDecoder(), weights[2], "decoder").to(device) if len(weights) == 3 else None

    @torch.no_grad()
    def __call__(self, rgb: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] in [0, 1] at ``size`` -> [B, H, W] maps, blurred and normalised to [0, 1]."""
        rgb = rgb.to(self.device)
        if self.decoder is None:
            pred = self.encoders[0](rgb)
        else:
            pred = self.decoder(self.encoders[0].readouts(rgb), self.encoders[1].readouts(rgb), self.size)
        blur = EMLNET_BLUR * self.size[0] / EMLNET_SIZE[0]  # the official blur, scaled with the input size
        return normalise01(gaussian_blur(pred[:, 0].float().cpu(), blur))
