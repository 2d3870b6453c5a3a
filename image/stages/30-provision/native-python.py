#!/opt/native-python/bin/python3.11 -I
"""The Python that Ansible's modules run with in the image build's arm64 chroot: the build machine's own.

provision.sh binds the build machine's Python 3.11 (its binary and standard library) into the chroot
at /opt/native-python and makes this script Ansible's interpreter there. A module that imports only
the standard library and Ansible's own code (template, copy, file, user, systemd_service, ...) runs
natively: its work is file operations and the commands it starts, which are the chroot's own arm64
programs (emulated). A module that needs the board's Python bindings (apt needs python3-apt, built for
arm64) is handed to the chroot's /usr/bin/python3, emulated, as it always was. Emulated, each task
paid seconds to start Python and unpack the module before doing anything.

Ansible pipelines the module to the interpreter's stdin (an AnsiballZ script naming its module in
clear, `mod_name='ansible.modules.NAME'`); the chosen Python gets the same bytes on its stdin.
"""

import os
import sys

# modules that import the board's own Python packages, and so run under the board's Python
BOARD_PYTHON = ("ansible.modules.apt", "ansible.modules.apt_repository", "ansible.modules.package_facts")

payload = sys.stdin.buffer.read()
board = any(f"mod_name='{name}'".encode() in payload for name in BOARD_PYTHON)
python = "/usr/bin/python3" if board else sys.executable
fd = os.memfd_create("ansiballz")
os.write(fd, payload)
os.lseek(fd, 0, os.SEEK_SET)
os.dup2(fd, 0)
os.close(fd)
os.execv(python, [python, "-"])
