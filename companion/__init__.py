"""companion: the code of the book, importable.

One concept per module, named for the concept:
- ``companion.attention``: scaled dot-product attention and masks (chapter 1).
- ``companion.profile``: the quick/gpu switch, device choice and seeding used by every chapter.
- ``companion.viz``: the plots the chapters share.
"""

from .profile import Profile, pick_device, profile, seed_everything

__version__ = "0.1.0"

__all__ = ["Profile", "pick_device", "profile", "seed_everything", "__version__"]
