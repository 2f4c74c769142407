# costopt service image (docker-compose.yml pairs it with PostgreSQL; tests/test_project_files.py checks both).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY costopt ./costopt
COPY pricing ./pricing
COPY providers ./providers
COPY api ./api
COPY data ./data
# the default training script of `costopt drill`
COPY examples ./examples
RUN pip install --no-cache-dir -e . \
    && useradd --create-home --uid 10001 costopt \
    && mkdir -p /app/var && chown costopt /app/var
USER costopt
ENV COSTOPT_API_HOST=0.0.0.0 \
    PYTHONUNBUFFERED=1
EXPOSE 8000
# exec: the service is the container's main process and gets `docker stop`'s SIGTERM (graceful shutdown)
CMD ["sh", "-c", "costopt db migrate && exec costopt serve"]
