"""Transfer results: a failed receive is also reported as finished."""

from core.kv_transfer.interface import KVConnectorOutput


def test_failed_receive_counts_as_finished_receiving():
    output = KVConnectorOutput(finished_recving={"a"}, failed_recving={"b"})
    assert output.finished_recving == {"a", "b"}
    assert output.failed_recving == {"b"}
    assert output.finished_sending == set()
