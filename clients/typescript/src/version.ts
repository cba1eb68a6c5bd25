/** This library's version: payonce's own release, which its server names in `Payonce-Version` (the two
 * are released together; tests/project/test_version.py holds this, package.json and the server's equal). */
export const VERSION = "0.43.0";
