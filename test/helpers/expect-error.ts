import { expect } from 'chai';
import type { Response } from './harness.js';

/** Asserts an error response: the status, and a body that is exactly `{"error": "<non-empty text>"}`. */
export function expectError(r: Response, status: number, message?: RegExp | string): string {
  expect(r.status, `status (body: ${r.text})`).to.equal(status);
  expect(r.headers.get('content-type') ?? '').to.match(/^application\/json/);
  expect(r.json, `body: ${r.text}`).to.be.an('object');
  expect(Object.keys(r.json)).to.deep.equal(['error']);
  expect(r.json.error).to.be.a('string').and.not.equal('');
  if (typeof message === 'string') expect(r.json.error).to.equal(message);
  else if (message) expect(r.json.error, r.json.error).to.match(message);
  return r.json.error as string;
}

/** A raw body of `bytes` bytes that is valid JSON (an object with one long string field). */
export function bigJsonBody(bytes: number, fields: Record<string, unknown> = {}): string {
  const head = JSON.stringify({ ...fields, pad: '' });
  return head.slice(0, -2) + 'x'.repeat(Math.max(0, bytes - head.length)) + '"}';
}
