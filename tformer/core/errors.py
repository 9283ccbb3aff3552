"""One exception type for bad input: the CLI turns it into one line and exit status 2."""


class TformerError(ValueError):
    """Bad input from the user: an impossible config, an unknown name, a corrupt file.

    The message names the problem and the fix, in one line.
    """
