"""What a runner prints besides its events: kept whole in the job's full log, but the
frameworks' own chatter (Python warnings with their source lines, Paddle's C++ glog lines,
PaddleNLP's and Paddle's logger lines) is marked as noise and left out of the log panel.

One classifier per job (``OutputFilter``): a Python warning spans several lines (its header,
a message that may itself run over lines, the source line ``warnings`` prints indented by two
spaces), so it remembers where it is.
"""

import re

# "/…/paddle/utils/cpp_extension/extension_utils.py:712: UserWarning: No ccache found."
WARNING = re.compile(r"^\S+\.py:\d+: \w*(Warning|Deprecation)\w*:")
# The source line ``warnings`` prints under its header: two spaces, then code.
SOURCE = re.compile(r"^  \S")
# glog's information and warning lines: "W1206 07:17:03.142431 19847 eager_utils.cc:3584] …".
GLOG = re.compile(r"^[IW]\d{4} \d{2}:\d{2}:\d{2}\.\d+\s+\d+ \S+:\d+\]")
# PaddleNLP's and Paddle's loggers: "[2026-12-06 14:30:02,721] [    INFO] config.py:59 - …",
# coloured or not; their errors stay in the panel.
LOGGER = re.compile(r"^(\x1b\[[\d;]*m)?\[\d{4}-\d{2}-\d{2} [\d:,.]+\] \[ *(DEBUG|INFO|WARNING)\]")
# A warning's message that runs on without its source line is cut off after this many lines.
MAX_WARNING_LINES = 12


class OutputFilter:
    def __init__(self) -> None:
        self.in_warning = 0  # lines seen of the warning being printed, 0 outside one

    def is_noise(self, line: str) -> bool:
        if WARNING.match(line):
            self.in_warning = 1
            return True
        if self.in_warning and self.in_warning < MAX_WARNING_LINES:
            self.in_warning += 1
            if SOURCE.match(line):  # its last line
                self.in_warning = 0
            return True
        self.in_warning = 0
        return bool(GLOG.match(line) or LOGGER.match(line))
