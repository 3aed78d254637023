/**
 * The one error type services throw. The HTTP layer turns it into `{"error": message}` with
 * `status`; services never see Koa. Anything else that escapes is a 500 with a generic message.
 */
export class AppError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
    this.name = 'AppError';
  }
}

export const badRequest = (message: string) => new AppError(400, message);
export const notFound = (message: string) => new AppError(404, message);
export const conflict = (message: string) => new AppError(409, message);
export const forbidden = (message: string) => new AppError(403, message);
