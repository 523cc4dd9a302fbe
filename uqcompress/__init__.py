"""uqcompress: smaller transformer classifiers that know when they do not know."""

__version__ = "0.1.0"
