__version__ = "0.43.0"
