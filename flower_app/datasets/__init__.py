"""Dataset loaders (official formats) and calibrated synthetic stand-ins."""
