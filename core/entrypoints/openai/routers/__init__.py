"""The server's routes as FastAPI routers, one module per concern; each router is built
over what its routes use, passed explicitly, and `api_server.build_app` mounts them."""
