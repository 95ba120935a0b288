# projectionist in a container: the embedded default (filesystem store + SQLite log) on /data,
# with the S3 and PostgreSQL drivers installed for replicas. Build from the checkout:
#   docker build -t projectionist .
# As a sidecar beside an agent (config/deploy/compose.yaml, config/deploy/sidecar-pod.yaml) it
# listens on 127.0.0.1 and the agent reaches it on localhost; on its own, published on a port,
# it listens on every interface and then needs client tokens (PROJECTIONIST_CLIENT_TOKENS):
# serving strangers without them is refused (OPEN_PROXY_REFUSED).
FROM python:3.11-slim

WORKDIR /src
COPY pyproject.toml README.md __init__.py ./
COPY policy/ policy/
COPY adapters/ adapters/
COPY proxy/ proxy/
COPY config/ config/
RUN pip install --no-cache-dir '.[s3,postgres]' \
    && useradd --system --uid 10001 --home-dir /data projectionist \
    && mkdir -p /data && chown projectionist /data

USER projectionist
WORKDIR /data
VOLUME ["/data"]
# the proxy, and the console with the admin API on a listener of their own
EXPOSE 8787 8788
HEALTHCHECK --interval=30s --timeout=3s CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8787/readyz', timeout=2)"]
CMD ["projectionist", "serve", "--host", "0.0.0.0", "--port", "8787", "--admin-listen", "0.0.0.0:8788", "--data-dir", "/data"]
