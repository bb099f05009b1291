"""Stop signals: SIGTERM and SIGINT while training ask the loop to save a checkpoint and exit (`StopSignals`)."""

import signal


class StopSignals:
    """SIGTERM and SIGINT (Ctrl-C) while training are requests: the loop finishes its step, saves a checkpoint and
    exits, every process at the same step (`requested` goes into the step's vote). `restore_defaults()` ends that
    once the model folder is saved: a Ctrl-C then stops the program at once (KeyboardInterrupt), as usual."""

    def __init__(self):
        self.number = 0
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, self._request)

    def _request(self, number, frame):
        self.number = number

    @property
    def requested(self) -> bool:
        return bool(self.number)

    @staticmethod
    def restore_defaults():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
