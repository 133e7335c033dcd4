"""How make run / make test find their services when nothing is configured."""

from infra import services


def test_services_broker_falls_back_to_filesystem(monkeypatch, capsys):
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.setattr(services, "_redis_answers", lambda *a, **k: False)
    monkeypatch.setattr(services.shutil, "which", lambda name: None)
    broker = services.ensure_broker()
    assert (broker.url, broker.how) == ("filesystem://", "fallback")
    assert "filesystem broker" in capsys.readouterr().err  # said plainly


def test_services_unreachable_broker_url_is_reported_and_replaced(monkeypatch, capsys):
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setattr(services, "_redis_answers", lambda *a, **k: False)
    monkeypatch.setattr(services.shutil, "which", lambda name: None)
    broker = services.ensure_broker()
    assert broker.how == "fallback"
    assert "CELERY_BROKER_URL=redis://127.0.0.1:1/0 is not reachable" in capsys.readouterr().err


def test_services_unreachable_database_url_uses_embedded(monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", "postgres://nobody:secret@127.0.0.1:1/nowhere")
    database = services.ensure_postgres()
    try:
        assert database.how == "embedded" and "host=" in database.url
        err = capsys.readouterr().err
        assert "is not reachable" in err and "secret" not in err  # the password is redacted
    finally:
        database.shutdown()  # stops it only if this test started it
