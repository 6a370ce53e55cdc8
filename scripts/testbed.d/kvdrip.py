"""A KV server that drips (issue #19's "a server that answers one byte per
second"): it accepts connections on ADDR PORT, reads whatever a client
sends, and answers every connection with one byte per second of a reply
that never ends (a bulk string of 1 GiB). Touches READY_FILE once listening.

Usage: kvdrip.py ADDR PORT READY_FILE
"""
import socket
import sys
import threading
import time


def serve(conn):
    header = b"$1073741824\r\n"
    conn.settimeout(0)
    i = 0
    try:
        while True:
            try:
                if not conn.recv(65536):
                    return  # the client hung up
            except BlockingIOError:
                pass
            conn.sendall(header[i:i + 1] if i < len(header) else b"x")
            i += 1
            time.sleep(1)
    except OSError:
        return
    finally:
        conn.close()


def main():
    addr, port, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(64)
    open(ready, "w").close()
    while True:
        conn, _ = s.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
