"""Units shared by every module that prints or converts sizes (one definition each)."""

KIB = 2**10
MIB = 2**20
GIB = 2**30
