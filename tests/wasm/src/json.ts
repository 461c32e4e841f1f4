// A small JSON reader for the test modules' configurations (the AssemblyScript proxy-wasm
// runtime has none). Objects keep their keys in order; numbers are f64.

export const J_NULL: i32 = 0;
export const J_BOOL: i32 = 1;
export const J_NUM: i32 = 2;
export const J_STR: i32 = 3;
export const J_ARR: i32 = 4;
export const J_OBJ: i32 = 5;

export class JValue {
  kind: i32 = J_NULL;
  str: string = "";
  num: f64 = 0;
  flag: bool = false;
  items: Array<JValue> = new Array<JValue>();
  keys: Array<string> = new Array<string>();

  has(key: string): bool {
    return this.keys.indexOf(key) >= 0;
  }

  get(key: string): JValue {
    let i = this.keys.indexOf(key);
    if (i < 0) return new JValue();
    return this.items[i];
  }

  getString(key: string): string {
    return this.get(key).str;
  }

  getInt(key: string, dflt: i32): i32 {
    let v = this.get(key);
    if (v.kind != J_NUM) return dflt;
    return <i32>v.num;
  }
}

class Parser {
  s: string;
  i: i32 = 0;
  ok: bool = true;

  constructor(s: string) {
    this.s = s;
  }

  ws(): void {
    while (this.i < this.s.length) {
      let c = this.s.charCodeAt(this.i);
      if (c == 32 || c == 9 || c == 10 || c == 13) this.i++;
      else break;
    }
  }

  value(): JValue {
    this.ws();
    let v = new JValue();
    if (this.i >= this.s.length) {
      this.ok = false;
      return v;
    }
    let c = this.s.charCodeAt(this.i);
    if (c == 123) {
      // {
      v.kind = J_OBJ;
      this.i++;
      this.ws();
      if (this.s.charCodeAt(this.i) == 125) {
        this.i++;
        return v;
      }
      while (this.ok) {
        this.ws();
        let k = this.string();
        this.ws();
        if (this.s.charCodeAt(this.i) != 58) {
          this.ok = false;
          break;
        }
        this.i++;
        v.keys.push(k);
        v.items.push(this.value());
        this.ws();
        let d = this.s.charCodeAt(this.i);
        this.i++;
        if (d == 125) break;
        if (d != 44) this.ok = false;
      }
    } else if (c == 91) {
      // [
      v.kind = J_ARR;
      this.i++;
      this.ws();
      if (this.s.charCodeAt(this.i) == 93) {
        this.i++;
        return v;
      }
      while (this.ok) {
        v.items.push(this.value());
        this.ws();
        let d = this.s.charCodeAt(this.i);
        this.i++;
        if (d == 93) break;
        if (d != 44) this.ok = false;
      }
    } else if (c == 34) {
      v.kind = J_STR;
      v.str = this.string();
    } else if (this.s.substr(this.i, 4) == "true") {
      v.kind = J_BOOL;
      v.flag = true;
      this.i += 4;
    } else if (this.s.substr(this.i, 5) == "false") {
      v.kind = J_BOOL;
      this.i += 5;
    } else if (this.s.substr(this.i, 4) == "null") {
      this.i += 4;
    } else {
      let start = this.i;
      while (this.i < this.s.length) {
        let d = this.s.charCodeAt(this.i);
        if ((d >= 48 && d <= 57) || d == 45 || d == 43 || d == 46 || d == 101 || d == 69) this.i++;
        else break;
      }
      if (start == this.i) {
        this.ok = false;
      } else {
        v.kind = J_NUM;
        v.num = parseFloat(this.s.substring(start, this.i));
      }
    }
    return v;
  }

  string(): string {
    if (this.s.charCodeAt(this.i) != 34) {
      this.ok = false;
      return "";
    }
    this.i++;
    let out = "";
    while (this.i < this.s.length) {
      let c = this.s.charCodeAt(this.i);
      if (c == 34) {
        this.i++;
        return out;
      }
      if (c == 92) {
        this.i++;
        let e = this.s.charCodeAt(this.i);
        if (e == 110) out += "\n";
        else if (e == 116) out += "\t";
        else if (e == 114) out += "\r";
        else if (e == 117) {
          out += String.fromCharCode(<i32>parseInt(this.s.substr(this.i + 1, 4), 16));
          this.i += 4;
        } else out += String.fromCharCode(e);
        this.i++;
        continue;
      }
      out += String.fromCharCode(c);
      this.i++;
    }
    this.ok = false;
    return out;
  }
}

// The value of `text`; `null` when it is not JSON.
export function parse(text: string): JValue | null {
  let p = new Parser(text);
  let v = p.value();
  if (!p.ok) return null;
  return v;
}
