"""``modtrace record`` in a real terminal: the status line never shares a row with the
program's output, and the program's tqdm and rich progress bars render as without modtrace.

The program runs under ``modtrace record`` in a pseudo-terminal (stdout and stderr both on it,
as in a shell); the bytes the terminal receives are replayed through ``Screen``, a minimal
terminal (the control sequences tqdm, rich and the status line use), and the rows it ends
with are what a person would read.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

WIDTH = 100

PROGRAM = """\
import time

import torch
from rich.progress import Progress
from tqdm import tqdm

net = torch.nn.Linear(4, 4)
for step in range(3):
    net(torch.ones(1, 4))
    print(f"step {step} loss {1.0 / (step + 1):.4f}", flush=True)
    time.sleep(1.8)  # quiet long enough for the status line to be drawn
for _ in tqdm(range(20), desc="train", ncols=80):
    net(torch.ones(1, 4))
    time.sleep(0.1)
time.sleep(1.8)
with Progress() as progress:
    task = progress.add_task("rich-task", total=10)
    for _ in range(10):
        net(torch.ones(1, 4))
        time.sleep(0.1)
        progress.advance(task)
print("done", flush=True)
"""

STATUS = "\r\x1b[Kmodtrace: tty "  # how the status line is drawn (progress.CLEAR_LINE + its text)


class Screen:
    """Rows of characters and a cursor; rows are never scrolled away."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.rows: list[list[str]] = [[]]
        self.row = 0
        self.col = 0

    def _line(self) -> list[str]:
        while len(self.rows) <= self.row:
            self.rows.append([])
        return self.rows[self.row]

    def row_text(self) -> str:
        return "".join(self._line()).rstrip()

    def feed(self, text: str) -> None:
        i = 0
        while i < len(text):
            ch = text[i]
            if ch == "\x1b":
                i = self._escape(text, i)
                continue
            if ch == "\r":
                self.col = 0
            elif ch == "\n":
                self.row += 1
            elif ch == "\b":
                self.col = max(0, self.col - 1)
            elif ch >= " ":
                if self.col >= self.width:  # the terminal wraps when a character follows a full row
                    self.row += 1
                    self.col = 0
                line = self._line()
                line.extend(" " * (self.col + 1 - len(line)))
                line[self.col] = ch
                self.col += 1
            i += 1

    def _escape(self, text: str, i: int) -> int:
        if text.startswith("\x1b]", i):  # operating system command, up to BEL or ST
            end = min((j for j in (text.find("\x07", i), text.find("\x1b\\", i)) if j >= 0), default=len(text))
            return end + (2 if text.startswith("\x1b\\", end) else 1)
        m = re.compile(r"\x1b\[([?0-9;]*)([@-~])").match(text, i)
        if m is None:
            return i + 2
        args = [int(a) for a in m.group(1).lstrip("?").split(";") if a.isdigit()]
        n = args[0] if args else 0
        line = self._line()
        match m.group(2):
            case "K":
                if n == 0:
                    del line[self.col:]
                elif n == 1:
                    line[: self.col + 1] = " " * min(len(line), self.col + 1)
                else:
                    line.clear()
            case "A":
                self.row = max(0, self.row - max(n, 1))
            case "B":
                self.row += max(n, 1)
            case "C":
                self.col = min(self.width - 1, self.col + max(n, 1))
            case "D":
                self.col = max(0, self.col - max(n, 1))
            case "G":
                self.col = max(n, 1) - 1
            case _:  # colours, cursor visibility: nothing a reader sees as text
                pass
        return m.end()

    def lines(self) -> list[str]:
        return ["".join(r).rstrip() for r in self.rows]


def record_in_terminal(work: Path) -> str:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, WIDTH, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TERM")}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen(
        [sys.executable, "-m", "modtrace", "record", "--run", "tty", "program.py"],
        cwd=work, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=120) == 0
    return b"".join(chunks).decode()


def test_the_status_line_never_shares_a_row_with_the_programs_output(tmp_path: Path) -> None:
    (tmp_path / "program.py").write_text(PROGRAM)
    received = record_in_terminal(tmp_path)
    parts = received.split(STATUS)
    assert len(parts) > 1, "the status line was never drawn: the test shows nothing"

    screen = Screen(WIDTH)
    screen.feed(parts[0])
    for part in parts[1:]:
        # Each time the status line is drawn, the row it takes must be empty (or hold the
        # status line drawn before): it erases nothing of the program's.
        row = screen.row_text()
        assert row == "" or row.startswith(STATUS[4:]), f"the status line was drawn over {row!r}"
        screen.feed(STATUS + part)

    lines = [line for line in screen.lines() if line]
    assert not [line for line in lines if "modtrace: tty " in line], lines  # erased wherever it was drawn
    want = ["step 0 loss 1.0000", "step 1 loss 0.5000", "step 2 loss 0.3333"]
    assert lines[:3] == want, lines
    train = [line for line in lines if line.startswith("train: ")]
    assert len(train) == 1 and train[0].startswith("train: 100%") and "20/20" in train[0], lines
    rich_rows = [line for line in lines if "rich-task" in line]
    assert len(rich_rows) == 1 and rich_rows[0].startswith("rich-task") and "100%" in rich_rows[0], lines
    assert lines.index(train[0]) < lines.index(rich_rows[0]) < lines.index("done")
    assert re.fullmatch(r"modtrace: run 'tty' \(id 1\) completed: [\d,]+ events, \d+ steps", lines[-1]), lines
