/** Exit 2: the command line is wrong, or the server cannot be reached (or is not Arbiter). */
export class CliUsageError extends Error {}
/** Exit 1: the policies, the server or the tests said no. */
export class Refused extends Error {}
/** Exit 1: the server answered this 4xx. */
export class HttpRefused extends Refused {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}
