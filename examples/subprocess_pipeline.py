"""A pipeline of child processes, `tr a-z A-Z | sort | uniq -c`, built by hand.

    python examples/subprocess_pipeline.py

The program feeds words to the first child's stdin, joins each child's
stdout to the next one's stdin with an OS pipe, reads the last child's
output, and waits for every exit code. Then it runs the same pipeline
through the shell to show both give the same answer.
"""

import asyncio
import os
from asyncio.subprocess import PIPE

import zuvrs

WORDS = b"loop\nrust\nlibuv\nloop\nasyncio\nrust\nloop\n"


async def pipeline(commands: list[list[str]], data: bytes) -> tuple[bytes, list[int]]:
    """Run commands as a pipeline; give it data on stdin; return its output and exit codes."""
    children = []
    stdin = PIPE
    for i, command in enumerate(commands):
        last = i == len(commands) - 1
        read_end, write_end = (None, PIPE) if last else os.pipe()
        child = await asyncio.create_subprocess_exec(*command, stdin=stdin, stdout=write_end)
        # The children hold their own copies of the pipe's ends now.
        if stdin is not PIPE:
            os.close(stdin)
        if not last:
            os.close(write_end)
            stdin = read_end
        children.append(child)

    async def feed() -> None:
        children[0].stdin.write(data)
        await children[0].stdin.drain()
        children[0].stdin.close()

    _, output = await asyncio.gather(feed(), children[-1].stdout.read())
    codes = [await child.wait() for child in children]
    return output, codes


async def main() -> None:
    output, codes = await pipeline([["tr", "a-z", "A-Z"], ["sort"], ["uniq", "-c"]], WORDS)
    print(output.decode().rstrip())
    print("exit codes:", codes)

    shell = await asyncio.create_subprocess_shell("tr a-z A-Z | sort | uniq -c", stdin=PIPE, stdout=PIPE)
    shell_output, _ = await shell.communicate(WORDS)
    print("the shell's pipeline gives the same:", shell_output == output, "exit code", shell.returncode)


if __name__ == "__main__":
    zuvrs.run(main())
