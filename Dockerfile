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
# MALLOC_ARENA_MAX=2: glibc's malloc keeps up to 8 arenas per core, one per thread that allocates; the
# service's threads (engine workers, scheduler, request pool) each freed memory into their own and RSS grew
# with what the arenas held free (bench/soak.py, docs/reliability.md "Soak"). MALLOC_MMAP_THRESHOLD_ and
# MALLOC_TRIM_THRESHOLD_: a block of 64 KiB or more is its own mapping, returned when freed (glibc otherwise
# raises that threshold up to 32 MiB as large blocks are freed, and the query results and frames then
# fragment the arenas), and free memory at an arena's top is given back past 128 KiB.
# ARROW_DEFAULT_MEMORY_POOL=system: pyarrow (pandas' string columns) allocates through the same malloc
# instead of its own mimalloc pool, which held 33-41 MB a worker for 0.3 MB in use.
ENV COSTOPT_API_HOST=0.0.0.0 \
    PYTHONUNBUFFERED=1 \
    MALLOC_ARENA_MAX=2 \
    MALLOC_MMAP_THRESHOLD_=65536 \
    MALLOC_TRIM_THRESHOLD_=131072 \
    ARROW_DEFAULT_MEMORY_POOL=system
EXPOSE 8000
# exec: the service is the container's main process and gets `docker stop`'s SIGTERM (graceful shutdown)
CMD ["sh", "-c", "costopt db migrate && exec costopt serve"]
