from torchvision._stand_in import module_getattr

__getattr__ = module_getattr("torchvision.transforms.v2.functional")
