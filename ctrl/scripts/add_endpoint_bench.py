#!/usr/bin/env python3
# add_endpoint latency of a real brindle-ctrl against a fake vrouter (Python, answers ok).
# usage: cd $(mktemp -d) && python3 add_endpoint_bench.py <path to brindle-ctrl> <count>
import json, os, socket, subprocess, sys, threading, time
d = os.getcwd()
vs = d + "/vrouter.sock"
srv = socket.socket(socket.AF_UNIX); srv.bind(vs); srv.listen(8)
def conn(c):
    f = c.makefile("rwb")
    for line in f:
        req = json.loads(line)
        res = {"version":1,"boot_id":"b"} if req["op"] == "hello" else {"changed":1}
        f.write((json.dumps({"status":"ok","result":res})+"\n").encode()); f.flush()
def acc():
    while True:
        c,_ = srv.accept(); threading.Thread(target=conn, args=(c,), daemon=True).start()
threading.Thread(target=acc, daemon=True).start()
env = dict(os.environ, BRINDLE_CONFIG="/dev/null", BRINDLE_NODE_NAME="n1", BRINDLE_NODE_ADDRESS="127.0.0.1",
  BRINDLE_API_SOCKET=d+"/ctrl.sock", BRINDLE_VROUTER_SOCKET=vs, BRINDLE_DATASTORE_PATH=d+"/data",
  BRINDLE_BGP_LISTEN_PORT="17911", BRINDLE_METRICS_LISTEN="127.0.0.1:19111", RUST_LOG="warn")
p = subprocess.Popen([sys.argv[1]], env=env, stderr=open(d+"/log","w"))
try:
    while not os.path.exists(d+"/ctrl.sock"): time.sleep(0.05)
    time.sleep(2)
    s = socket.socket(socket.AF_UNIX); s.connect(d+"/ctrl.sock"); f = s.makefile("rwb")
    N = int(sys.argv[2]); lat = []
    for i in range(N):
        ep = {"key":{"network":"net","container_id":"c%d"%i,"ifname":"eth0"},"netns":"/x","host_ifname":"bri%011x"%i,
              "host_ifindex":i,"host_mac":"ee:ee:ee:ee:ee:ee","pod_mac":"02:00:00:00:00:01",
              "ips":["10.244.%d.%d/32"%(i//250, i%250)],"mtu":1480}
        t = time.perf_counter()
        f.write((json.dumps({"op":"add_endpoint","endpoint":ep})+"\n").encode()); f.flush()
        r = json.loads(f.readline()); assert r["status"] == "ok", r
        lat.append(time.perf_counter()-t)
    lat.sort()
    print("add_endpoint x%d: median %.2f ms, p99 %.2f ms, total %.2f s" % (N, lat[N//2]*1e3, lat[int(N*0.99)]*1e3, sum(lat)))
    time.sleep(1.5)
    import urllib.request
    m = urllib.request.urlopen("http://127.0.0.1:19111/metrics").read().decode()
    for l in m.splitlines():
        if l.startswith("brindle_ctrl_programming_seconds_sum") or l.startswith("brindle_ctrl_programming_seconds_count") or l.startswith("brindle_ctrl_endpoints "): print(l)
finally:
    p.terminate(); p.wait()
