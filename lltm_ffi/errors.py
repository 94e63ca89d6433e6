"""The exceptions and the warning lltm_ffi raises. Each survives pickling
(a multiprocessing worker's error reaches its parent whole)."""


class LLTMError(RuntimeError):
    """A non-zero code from the C shim, with the shim's (CUDA's) own message."""

    def __init__(self, function, code, message):
        super().__init__(f"{function} failed: {message} (error code {code})")
        self.function = function
        self.code = code
        self.message = message

    def __reduce__(self):
        # The constructor's arguments, not the formatted text in self.args;
        # then the instance's own attributes (notes added to it, say).
        return type(self), (self.function, self.code, self.message), self.__dict__


class LLTMBuildError(ImportError):
    """The compiled module is missing, does not load, or is stale."""


class LLTMBuildWarning(UserWarning):
    """Issued at import when the compiled module cannot be used."""
