__version__ = "0.42.0"
