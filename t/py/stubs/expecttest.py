"""A stand-in for the `expecttest` module PyTorch's test helpers import
(Debian ships python3-torch without it). The distributed suite never
compares against expected text; the names common_utils touches are here.
"""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    longMessage = True

    def assertExpectedInline(self, actual, expect, skip=0):
        self.assertEqual(actual.strip(), expect.strip())

    def assertExpectedRaisesInline(self, exc_type, callable, expect, *args,
                                   **kwargs):
        try:
            callable(*args, **kwargs)
        except exc_type as e:
            self.assertExpectedInline(str(e), expect)
            return
        self.fail("did not raise " + exc_type.__name__)
