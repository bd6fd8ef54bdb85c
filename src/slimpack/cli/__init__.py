"""The ``slimpack`` command line: one module per command, registered in ``main.COMMANDS``.

Commands hold no logic of their own: they parse flags, call the library, and print.
"""
