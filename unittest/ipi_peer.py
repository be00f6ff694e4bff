#!/usr/bin/env python3
"""Peers of the i-PI server for the protocol tests of `teacher ipi`
(test_finetune_ipi_faults.cpp, IpiProtocol.*): the standard library only, so
that it also runs as another user (setpriv --reuid=nobody /usr/bin/python3).

  ipi_peer.py MODE (--unix NAME | --tcp HOST PORT) [--after S] [--hold S]
              [--force F] [--hang-after K] [--log FILE]

It waits for the server (the Unix socket file, or a TCP connect that
succeeds) up to 60 s, then --after seconds, then connects and acts:

  silent   never answers (holds the connection --hold seconds)
  probe    closes the connection at once (another run checking the address)
  hello    answers STATUS with a header no i-PI client sends
  client   an i-PI client (READY; forces of --force Hartree/Bohr along x on
           every atom, energy and virial 0); with --hang-after K it stops
           answering after K configurations; with --extra-hang it announces
           an extra string and never sends it
It prints what happened ("connected", "refused: ...", "got EXIT", ...) and
exits 0.
"""

import argparse
import os
import socket
import struct
import sys
import time


def connect(a):
    deadline = time.time() + 60.0
    if a.unix:
        path = "/tmp/ipi_" + a.unix
        while not os.path.exists(path) and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(a.after)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        return s
    host, port = a.tcp[0], int(a.tcp[1])
    while True:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        s = socket.socket(info[0], socket.SOCK_STREAM)
        try:
            s.connect(info[4])
            break
        except OSError:
            s.close()
            if time.time() > deadline:
                raise
            time.sleep(0.02)
    if a.after > 0:    # a fresh connection after the wait
        s.close()
        time.sleep(a.after)
        s = socket.socket(info[0], socket.SOCK_STREAM)
        s.connect(info[4])
    return s


def recv_exactly(s, n):
    b = b""
    while len(b) < n:
        k = s.recv(n - len(b))
        if not k:
            raise EOFError("the server closed the connection")
        b += k
    return b


def header(s):
    return recv_exactly(s, 12).decode().strip()


def send_header(s, h):
    s.sendall(h.ljust(12).encode())


def client(s, a):
    natoms, have, done = 0, False, 0
    while True:
        h = header(s)
        if h == "EXIT":
            print("got EXIT")
            return
        if h == "STATUS":
            if a.hang_after and done >= a.hang_after:
                print(f"hangs after {done} configurations")
                time.sleep(a.hold)
                return
            send_header(s, "HAVEDATA" if have else "READY")
        elif h == "POSDATA":
            recv_exactly(s, 144)
            natoms = struct.unpack("i", recv_exactly(s, 4))[0]
            recv_exactly(s, 24 * natoms)
            have = True
        elif h == "GETFORCE":
            send_header(s, "FORCEREADY")
            body = struct.pack("d", 0.0) + struct.pack("i", natoms)
            body += struct.pack(f"{3 * natoms}d", *([a.force, 0.0, 0.0] * natoms))
            body += struct.pack("9d", *([0.0] * 9))
            if a.extra_hang:
                s.sendall(body + struct.pack("i", 100))
                print("announced an extra string and sends nothing")
                time.sleep(a.hold)
                return
            s.sendall(body + struct.pack("i", 0))
            have = False
            done += 1
        else:
            print(f"unexpected header {h!r}")
            return


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["silent", "probe", "hello", "client"])
    p.add_argument("--unix")
    p.add_argument("--tcp", nargs=2)
    p.add_argument("--after", type=float, default=0.0)
    p.add_argument("--hold", type=float, default=30.0)
    p.add_argument("--force", type=float, default=0.0)
    p.add_argument("--hang-after", type=int, default=0)
    p.add_argument("--extra-hang", action="store_true")
    a = p.parse_args()
    try:
        s = connect(a)
    except OSError as e:
        print(f"refused: {e.strerror or e}")
        return
    print("connected")
    sys.stdout.flush()
    try:
        if a.mode == "silent":
            time.sleep(a.hold)
        elif a.mode == "probe":
            s.close()
        elif a.mode == "hello":
            header(s)
            send_header(s, "HELLO")
            s.recv(12)
        else:
            client(s, a)
    except (EOFError, OSError) as e:
        print(f"dropped: {e}")


if __name__ == "__main__":
    main()
