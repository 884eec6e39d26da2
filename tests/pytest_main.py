"""Entry point for Bazel py_test targets: runs pytest on the files given as arguments."""

import sys

import pytest

if __name__ == "__main__":
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-c", "pytest.ini", *sys.argv[1:]]))
