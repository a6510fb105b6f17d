"""What sd-meta's end-to-end tests (e2e_meta.py, e2e_meta_sources.py) share:
reading the final skip summary, writing fixtures, a scratch directory per
test."""
import os
import shutil
import tempfile
import unittest


def skipped(err, reason):
    """The count printed for a reason in the final summary (0 if absent)."""
    for line in err.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[0] == "sd-meta:" and parts[1].isdigit() and parts[2] == reason:
            return int(parts[1])
    return 0


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write(path, data):
    """Write text or bytes, making the directories on the way."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


class Base(unittest.TestCase):
    """A scratch directory per test; p() joins paths inside it."""
    prefix = "sdmeta-"

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix=self.prefix)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def p(self, *parts):
        return os.path.join(self.dir, *parts)
