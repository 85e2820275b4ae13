"""What importing torchvision provides to code that never runs vision: names only; every call raises."""

import enum


def _unavailable(name):
    def call(*args, **kwargs):
        raise RuntimeError(f"torchvision stand-in (tests/stubs): {name} is not available; no vision code runs here")

    call.__name__ = name.rsplit(".", 1)[-1]
    return call


def module_getattr(module):
    """A module-level ``__getattr__``: any public name is a function that raises when called."""

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _unavailable(f"{module}.{name}")

    return __getattr__


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class ImageReadMode(enum.Enum):
    UNCHANGED = 0
    GRAY = 1
    GRAY_ALPHA = 2
    RGB = 3
    RGB_ALPHA = 4
