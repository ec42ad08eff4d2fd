"""Error types with messages meant for a reader of the book."""


class UnknownNameError(KeyError):
    """An unknown chip, model or exercise name. Prints its message without KeyError's quotes."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class DeviceCountError(RuntimeError):
    """JAX started with a device count the chapter cannot use."""
