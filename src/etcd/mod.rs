mod pb;
