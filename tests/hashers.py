"""A password hasher for the accounts the tests make (tests/settings.py)."""

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """PBKDF2 with one iteration instead of a million (~0.25 s a password on two cores,
    about 75 of them in a run). Its hashes are still ``pbkdf2_sha256``, with their
    iteration count inside, so the processes the tests start (product settings, the
    default hashers) verify them, and upgrade them on a login, as they would any."""

    iterations = 1
