# costopt service image (the compose file pairs it with PostgreSQL).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY costopt ./costopt
COPY pricing ./pricing
COPY providers ./providers
COPY api ./api
COPY data ./data
RUN pip install --no-cache-dir -e .
ENV COSTOPT_API_HOST=0.0.0.0
EXPOSE 8000
CMD ["sh", "-c", "costopt db migrate && costopt serve"]
