import paramserver


def test_public_names_are_pinned():
    assert sorted(paramserver.__all__) == sorted([
        "Client", "LocalCluster", "run", "load_model", "Config", "TableSpec", "Ring",
        "SGD", "AdaGrad", "FTRL", "Adam", "FtrlAdagrad", "RMSProp", "Zeros", "Normal", "Uniform", "rule", "Rule",
        "server_function",
        "ParamServerError", "ConfigError", "UnknownTableError", "ClosedError", "ConnectError",
        "NodeLostError", "RemoteError", "ProtocolError", "StaleRingError", "WorkerError", "CheckpointError",
        "QuotaError",
        "DataLossError",
    ])
    for name in paramserver.__all__:
        assert getattr(paramserver, name) is not None
