from torchvision._stand_in import ImageReadMode, module_getattr  # noqa: F401

__getattr__ = module_getattr("torchvision.io")
