"""The API answers before the daemon's jobs run: those routes say 503 ``starting`` with a Retry-After, not 500."""

from types import SimpleNamespace

from starlette.testclient import TestClient

from evolver.api import create_app
from evolver.config import Config


def test_job_routes_answer_503_starting_with_retry_after_until_the_jobs_exist(monkeypatch):
    monkeypatch.setenv("STARTING_TEST_TOKEN", "t0ken")  # the test client speaks TCP, which needs the token
    config = Config(daemon={"tcp_token_env": "STARTING_TEST_TOKEN"})
    host = SimpleNamespace(config=config, jobs=None)  # what a daemon is between binding its socket and its jobs
    with TestClient(create_app(host), headers={"Authorization": "Bearer t0ken"}) as http:
        for response in (http.post("/v1/evolve", json={"job": None}), http.get("/v1/evolve/r1")):
            assert response.status_code == 503, response.text
            assert response.json()["error"]["type"] == "starting"
            assert response.headers["retry-after"] == "1"
