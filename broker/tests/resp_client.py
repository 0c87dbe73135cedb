"""A redis-py client of idbroker's RESP listener (run by broker/tests/resp.rs).

Usage: python3 resp_client.py HOST PORT. Prints one "LO HI" line per range it got:
one QLIST.NEXT 5, then a pipeline of 50 QLIST.NEXT 2, in order. Any error is fatal.
"""
import sys

import redis

host, port = sys.argv[1], int(sys.argv[2])
# client_name: redis-py sends CLIENT SETNAME on connect, as applications often do.
r = redis.Redis(host=host, port=port, socket_timeout=10, client_name="qlist-test")
assert r.ping() is True
lo, hi = r.execute_command("QLIST.NEXT", 5)
print(int(lo), int(hi))
pipe = r.pipeline(transaction=False)
for _ in range(50):
    pipe.execute_command("QLIST.NEXT", 2)
for lo, hi in pipe.execute():
    print(int(lo), int(hi))
stats = r.execute_command("QLIST.STATS")
assert b"requests_ok" in stats, stats
try:
    r.execute_command("QLIST.NOPE")
    sys.exit("QLIST.NOPE did not fail")
except redis.ResponseError as e:
    assert "unknown command" in str(e), e
