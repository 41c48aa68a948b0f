import time
import testinfra

def test_latency(lab_host, tmp_path):
    cfg = tmp_path / "ssh_config"
    from opsctl.checks.plugin import ssh_config_text
    cfg.write_text(ssh_config_text([lab_host.host_config], tmp_path))
    for url in (f"ssh://lab?ssh_config={cfg}", f"paramiko://lab?ssh_config={cfg}"):
        h = testinfra.get_host(url)
        h.run("true")
        t = time.monotonic()
        for _ in range(10):
            h.run("true")
        print(url.split(":")[0], (time.monotonic() - t) / 10)
    import subprocess
    subprocess.run(["ssh", "-F", str(cfg), "-O", "exit", "lab"], capture_output=True)
    print(lab_host.run("cat /etc/pam.d/sshd | grep -v '^#' | grep . ; grep -i usepam /etc/ssh/sshd_config").stdout)
