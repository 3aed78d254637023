// The ceiling for any Node service: a bare node:http server that reads the request body and
// answers a fixed JSON body. Started as its own process by bench/run.ts; prints its port.
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';

const BODY = Buffer.from(JSON.stringify({ status: 'allow', request_id: 'x' }));

const server = createServer((req, res) => {
  req.on('data', () => undefined);
  req.on('end', () => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': BODY.length });
    res.end(BODY);
  });
});
server.keepAliveTimeout = 65_000;
server.listen(Number(process.env.PORT ?? 0), '127.0.0.1', () => {
  console.log(JSON.stringify({ port: (server.address() as AddressInfo).port }));
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
