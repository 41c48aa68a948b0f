import time, pytest
from opsctl.config import load_inventory
from opsctl.hosts import SSHConnection

def test_debug(lab_host):
    from checks_handmade import handmade_release
    import opsctl.deploy as D
    for name in ['make_plan','switch','wait_ready']:
        f=getattr(D,name)
        def wrap(*a,_f=f,_n=name,**k):
            t=time.monotonic(); r=_f(*a,**k); print(_n, round(time.monotonic()-t,2)); return r
        setattr(D,name,wrap)
    op=SSHConnection.run
    def run(self,cmd,**k):
        t=time.monotonic(); r=op(self,cmd,**k); dt=time.monotonic()-t
        if dt>0.5: print('SLOW',round(dt,2),cmd[:100])
        return r
    SSHConnection.run=run
    inv = load_inventory(lab_host.inventory_dir)
    t = time.monotonic()
    handmade_release(inv, "lab", "dflash")
    print("handmade", time.monotonic() - t)
    SSHConnection.run=op
    print(lab_host.run("ss -tan | grep -c TIME-WAIT; ss -K state time-wait '( sport = :30000 )' ; echo rc=$?; ss -tan | grep TIME-WAIT | head -3").stdout)
    print(lab_host.run("systemctl stop sglang-k26; ss -tan | grep -c TIME-WAIT; ss -K state time-wait '( sport = :30000 )' >/dev/null; echo rc=$?; ss -tan | grep -c TIME-WAIT; systemctl start sglang-k26; sleep 3; systemctl is-active sglang-k26").stdout)
