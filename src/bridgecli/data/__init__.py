"""Reading training data in common shapes and tokenising it into stream records."""
