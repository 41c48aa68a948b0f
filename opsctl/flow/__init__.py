"""The deploy pipeline, one module per step (README.md draws it):

    plan -> stage -> switch -> ready -> validate -> bench -> judge -> promote | rollback

`deploy.py` is that arrow and nothing else; `inspect.py` reads what the host says
(status, history). The CLI imports the step modules it needs; the steps talk to the
host through opsctl.host.connection and read its state through opsctl.releases and the journal.
"""
