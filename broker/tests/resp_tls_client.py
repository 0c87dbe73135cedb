"""A redis-py client of idbroker's RESP listener over TLS (run by broker/tests/tls.rs).

Usage: python3 resp_tls_client.py HOST PORT CA_FILE TOKEN. Prints one "LO HI" line per
range it got: one QLIST.NEXT 3, then a pipeline of 10 QLIST.NEXT 2, in order. Any error
is fatal.
"""
import sys

import redis

host, port, ca, token = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
r = redis.Redis(
    host=host,
    port=port,
    password=token,
    ssl=True,
    ssl_ca_certs=ca,
    socket_timeout=10,
)
assert r.ping() is True
lo, hi = r.execute_command("QLIST.NEXT", 3)
print(int(lo), int(hi))
pipe = r.pipeline(transaction=False)
for _ in range(10):
    pipe.execute_command("QLIST.NEXT", 2)
for lo, hi in pipe.execute():
    print(int(lo), int(hi))
