"""Library code shared by the tests (no fixtures: those live in the conftest.py files).

  resp       - RESP requests and replies, INFO text
  conn       - Raw (TCP bytes), UdpConn (UDP front end), client() (redis-py, RESP2)
  servers    - kvstore Nodes, a reference redis-server, ports, limits
  faultlib   - the log format read independently, `kvstore serve/recover` as processes
  pair       - two nodes in --durability remote, each the other's log peer; a writer model
  replwire   - the replication link's frames and handshake, client side; secret files
  udp_client - a checking UDP client, run as a script (also inside a netns)
"""
